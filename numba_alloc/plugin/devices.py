"""Device names as TensorFlow writes them ("GPU:0", "/device:GPU:0",
"/job:localhost/replica:0/task:0/device:GPU:0", "/physical_device:GPU:0").
"""

_TRACKED = "GPU"
_UNTRACKED = {"CPU": 1}  # device types that exist but whose memory is not tracked
_KNOWN_TYPES = {"GPU", "CPU", "TPU", "XLA_GPU", "XLA_CPU"}


def _number(text):
    """Whether ``text`` is an index as TensorFlow reads one: ASCII digits
    ("²" and "٣" are digits to str.isdigit, not to TensorFlow)."""
    return text.isascii() and text.isdigit()


def _fields(name, argument):
    """(device type, index or None) of a device name; ValueError if malformed."""
    device_type = index = None
    parts = [p for p in name.split("/") if p] if name.startswith("/") else [name]
    for part in parts:
        fields = part.split(":")
        key = fields[0].lower()
        if key == "job" and len(fields) == 2 and fields[1]:
            continue
        if key in ("replica", "task") and len(fields) == 2 and _number(fields[1]):
            continue
        prefixed = key in ("device", "physical_device")
        if prefixed:
            fields = fields[1:]
        if device_type is not None or not fields or not fields[0].isalpha():
            break
        if len(fields) == 2 and (_number(fields[1]) or fields[1] == "*"):
            device_type, index = fields[0].upper(), None if fields[1] == "*" else int(fields[1])
            continue
        if len(fields) == 1 and prefixed:
            device_type = fields[0].upper()
            continue
        break
    else:
        if device_type is not None:
            return device_type, index
    raise ValueError(f"Invalid device name: {argument}={name!r} (expected a name such as "
                     "'GPU:0' or '/device:GPU:0')")


def parse_device_name(name, argument="device"):
    """The GPU index a TensorFlow device name asks for (None for "GPU:*" or
    "/device:GPU", any GPU), decided without asking the driver anything.
    Raises ValueError naming ``argument`` for a malformed name, a device type
    other than GPU, and a device whose memory is not tracked ("CPU:0")."""
    if not isinstance(name, str):
        raise ValueError(f"Invalid device name: {argument}={name!r} (expected a string "
                         "such as 'GPU:0')")
    if name.isidentifier() and name.upper() not in _KNOWN_TYPES:
        raise ValueError(f"No matching devices found for {argument}={name!r} (expected a "
                         "name such as 'GPU:0')")
    device_type, index = _fields(name, argument)
    if device_type in _UNTRACKED:
        if index is None or index < _UNTRACKED[device_type]:
            raise ValueError(f"Memory statistics not tracked for device {argument}={name!r}: "
                             "numba_alloc tracks GPU memory only")
        raise ValueError(f"No matching devices found for {argument}={name!r}")
    if device_type != _TRACKED:
        raise ValueError(f"No matching devices found for {argument}={name!r}: numba_alloc "
                         "tracks GPUs only")
    return index


def match_gpu(name, index, gpu_count, argument="device"):
    """The GPU number ``index`` (from :func:`parse_device_name` of ``name``)
    selects among ``gpu_count`` GPUs. Raises ValueError naming ``argument``
    for no matching device or several."""
    matches = list(range(gpu_count)) if index is None else [i for i in range(gpu_count) if i == index]
    if not matches:
        raise ValueError(f"No matching devices found for {argument}={name!r}: there "
                         f"{_gpus(gpu_count)}")
    if len(matches) > 1:
        raise ValueError(f"Multiple devices matched with the device name {argument}={name!r}: "
                         f"GPU:0 to GPU:{gpu_count - 1}")
    return matches[0]


def _gpus(count):
    """'are 2 GPUs (GPU:0 to GPU:1)' and the like."""
    if count == 0:
        return "is no GPU"
    if count == 1:
        return "is 1 GPU (GPU:0)"
    return f"are {count} GPUs (GPU:0 to GPU:{count - 1})"



def check_gpu_number(number, gpu_count, argument="device"):
    """``number`` when it is one of ``gpu_count`` GPUs; ValueError naming
    ``argument`` otherwise."""
    if number >= gpu_count:
        raise ValueError(f"{argument}={number} names no GPU: there {_gpus(gpu_count)}")
    return number
