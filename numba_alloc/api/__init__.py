"""The public functions that name a device (PyTorch's, TensorFlow's and TensorFlow Large Model Support's names), bound to the plugin's pools. Imports the policy and the plugin."""
