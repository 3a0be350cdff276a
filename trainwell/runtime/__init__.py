"""What the process and the device are: the launch environment and process group (distributed.py), mixed
precision (precision.py), accelerate's launcher environment (accelerate_env.py), memory tracking (memory.py)."""
