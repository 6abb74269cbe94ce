"""``myxtts doctor``: ``run`` gathers the facts and runs every check; ``environment`` holds
the machine's checks (Python, torch, GPUs, compile, packages), ``data`` the store's,
dataset's and loader's; ``check`` the record each check returns and how a list of them is
printed.
"""
