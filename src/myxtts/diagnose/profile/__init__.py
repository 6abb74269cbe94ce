"""``myxtts profile``: ``run`` measures a window of the real training setup, ``phases``
times each step's phases, ``verdict`` decides what limits training, ``report`` prints it.
"""
