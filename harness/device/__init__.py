"""The accelerator a run uses, as far as the engine must know it: whether an error means the device ran out of
memory, giving cached memory back, and the peak memory of this process on a device (:mod:`harness.device.memory`).
Below every room that runs a defense, so the attacked process and the verdict's new processes follow one rule."""
