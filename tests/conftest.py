"""Test-wide setup: 8 fake CPU devices, so meshes such as (data=2, fsdp=2, expert=2) are real."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
