"""Pinning a command to CPUs: the pinned mode puts the server on one CPU and the load generator
on another, so that neither takes the other's cycles."""


def pinned(argv, cpus):
    """argv run under `taskset -c cpus` (e.g. "0" or "1-3"); argv itself when cpus is None."""
    if cpus is None:
        return list(argv)
    return ["taskset", "-c", cpus, *argv]
