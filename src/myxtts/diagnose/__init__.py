"""Where the time goes, and whether this machine can train: ``myxtts profile`` (a measured
window of the real training setup and a verdict), ``myxtts monitor`` (live GPU and run
figures) and ``myxtts doctor`` (environment and data checks); ``profile`` and ``doctor``
are packages of their own, ``monitor`` a module.

A layer of its own above ``train`` (the profiler runs the trainer's own setup) and beside
``inference``; the CLI is a thin shell over it.
"""
