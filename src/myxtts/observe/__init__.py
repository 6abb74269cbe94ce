"""Seeing what a run does, without slowing it: throughput and data-wait meters, metric
loggers, the progress bar, model FLOPs and MFU (``flops``) and NVML GPU utilisation
(``gpu``). Training, inference, benchmarks and ``myxtts profile`` share these definitions."""
