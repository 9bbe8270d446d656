"""The gpu_hw_error detector's parts, one job per module (the detector in forensics/detectors composes them).

- :mod:`.events`: kernel-log rows -> time-ordered event dicts on one host and clock (normalisation);
- :mod:`.placement`: host names, ranks through the shared identity frame, the profiled window;
- :mod:`.incident`: an incident being assembled, the per-host book of them, the passes that merge them;
- :mod:`.kernel`: one handler per kernel-log event kind (the state machine, as a dispatch table);
- :mod:`.aer`: PCIe AER lines -> error records -> link-loss, uncorrected and corrected-burst incidents;
- :mod:`.health`: ``nvidia-smi -q`` and ``dcgmi diag`` -> incidents;
- :mod:`.render`: incidents -> findings.
"""
