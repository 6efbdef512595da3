"""The commands: ``numba-alloc`` (demo, replay, run, bench) and the benchmark suite behind ``bench``. Imports every layer below; nothing imports it but the package's top."""
