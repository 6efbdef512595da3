"""The devices a pool runs on, behind the policy's Backend interface: the simulated device, and a GPU through Numba's driver bindings. Imports the policy and the device code."""
