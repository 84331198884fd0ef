"""`nvml` meter (desktop and data-centre NVIDIA GPUs, Volta or newer): the GPU's total energy counter
(nvmlDeviceGetTotalEnergyConsumption, mJ since driver load) read at the window's ends. NVML power is not
supported on Jetson (use tegrastats or jtop there)."""

import time

from edge.energy.power_log import EnergyReading


class NvmlMeter:
    name = "nvml"

    def __init__(self, index: int = 0):
        self.index = index
        self._nvml = None
        self._handle = None
        self._marks: list[tuple[float, int]] = []     # (monotonic s, counter mJ)

    @staticmethod
    def unavailable_reason() -> str | None:
        try:
            import pynvml
        except ImportError:
            return "nvidia-ml-py (pynvml) is not installed"
        try:
            pynvml.nvmlInit()
            pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(0))
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            return f"NVML has no energy counter here ({e})"
        return None

    def start(self) -> None:
        import pynvml
        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)

    def mark(self) -> float:
        """Read the counter now; returns the monotonic time the reading belongs to."""
        t = time.monotonic()
        self._marks.append((t, self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)))
        return t

    def energy(self, t0: float, t1: float) -> EnergyReading:
        """Energy between the marks taken at t0 and t1 (the counter is read by `mark`, not sampled)."""
        at = dict(self._marks)
        if t0 not in at or t1 not in at:
            return EnergyReading(None, t1 - t0, 0, "NVML counter not read at the window's ends")
        return EnergyReading((at[t1] - at[t0]) / 1000.0, t1 - t0, 2)

    def stop(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
