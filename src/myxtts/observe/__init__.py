"""Seeing what a run does, without slowing it: throughput and data-wait meters, metric
loggers, the progress bar, model FLOPs and MFU (``flops``), NVML GPU utilisation
(``gpu``) and the quality of synthesized mels (``quality``). Training, inference,
benchmarks and the coming ``myxtts profile`` share these definitions."""
