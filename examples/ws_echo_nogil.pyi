# Types of the compiled examples/ws_echo_nogil.pyx: a PyCapsule named "cyserve.nogil_ws_handler".
ECHO: object
