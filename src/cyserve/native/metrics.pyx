# The Metrics type, included in cyserve._core: the shared region the engine's threads count into
# (csrc/metrics.h), the slots of the serving processes, and the listener that answers scrapes in
# C. Made by whoever answers scrapes (the supervisor, or a single serving process) before any
# worker process is forked: the region is shared with the processes forked afterwards.
from cyserve.native.includes cimport server as cms


cdef class Metrics:
    """Counters for Prometheus: ``Metrics(nprocs, nshards)`` makes room for nprocs serving
    processes of nshards scheduler threads each. ``claim(pid)`` gives a process its slot (an
    int, handed to ``Server(metrics=..., metrics_slot=...)``), ``retire(slot)`` keeps an ended
    process's counts in the totals, ``text()`` is the exposition, ``serve(fd)`` answers
    ``GET /metrics`` on a listening socket from a C thread until ``close()``."""

    cdef cms.metrics_region_t *_r
    cdef cms.metrics_listener_t *_l
    cdef int _owner

    def __cinit__(self, unsigned nprocs, unsigned nshards):
        self._r = NULL
        self._l = NULL
        rc = cms.metrics_region_new(&self._r, nprocs, nshards)
        if rc != 0:
            raise ValueError(f"metrics: cannot make a region for {nprocs} processes of "
                             f"{nshards} threads (error {-rc})")
        self._owner = _os.getpid()

    @property
    def nshards(self):
        return self._r.nshards

    def claim(self, int pid):
        """A free slot for process pid, or -1 when every slot is taken."""
        rc = cms.metrics_claim(self._r, pid)
        return rc if rc >= 0 else -1

    def retire(self, int slot):
        """Process ``slot`` has ended: its counters join the totals, the slot is free."""
        if 0 <= slot < <int>self._r.nprocs:
            with nogil:
                cms.metrics_retire(self._r, slot)

    def health(self, int slot):
        """(beat_ns, stuck_ns) of slot: when its publisher last looked (CLOCK_MONOTONIC ns,
        0: not yet) and how long a thread had then been in one call."""
        cdef cms.metrics_proc_t *p
        if not 0 <= slot < <int>self._r.nprocs:
            return (0, 0)
        p = cms.metrics_proc_at(self._r, slot)
        return (p.beat_ns, p.stuck_ns)

    def route(self, int slot):
        """The pattern of the route whose Python call in slot's process had run longest when
        its publisher last looked ("" when none was running)."""
        cdef char buf[128]
        if not 0 <= slot < <int>self._r.nprocs:
            return ""
        n = cms.metrics_get_route(cms.metrics_proc_at(self._r, slot), buf, sizeof(buf))
        return buf[:n].decode("utf-8", "replace")

    def text(self):
        """The text exposition of every process's sums (bytes)."""
        cdef bytearray buf = bytearray(cms.METRICS_TEXT_MAX)
        cdef char *p = buf
        cdef ssize_t n
        with nogil:
            n = cms.metrics_format(self._r, p, cms.METRICS_TEXT_MAX)
        if n < 0:
            raise RuntimeError("metrics: the exposition does not fit")
        return bytes(buf[:n])

    def serve(self, int fd):
        """Answer scrapes on the listening socket fd (kept open by the caller until close())."""
        if self._l != NULL:
            raise RuntimeError("metrics: already serving")
        rc = cms.metrics_listen_start(&self._l, self._r, fd)
        if rc != 0:
            raise OSError(-rc, _os.strerror(-rc))

    def close(self):
        """Stop answering scrapes (the region stays until the object goes)."""
        if self._l != NULL:
            with nogil:
                cms.metrics_listen_stop(self._l)
            self._l = NULL

    cdef cms.metrics_proc_t *_slot(self, int slot):
        if not 0 <= slot < <int>self._r.nprocs:
            return NULL
        return cms.metrics_proc_at(self._r, slot)

    def __dealloc__(self):
        # A forked worker inherits the object but not the listener's thread: only the process
        # that started it stops it. The mapping is this process's own either way.
        if self._l != NULL and _os.getpid() == self._owner:
            cms.metrics_listen_stop(self._l)
        self._l = NULL
        if self._r != NULL:
            cms.metrics_region_free(self._r)
            self._r = NULL
