# Types of the compiled examples/hello_nogil.pyx: two PyCapsules named "cyserve.nogil_handler".
ROOT: object
FIBONACCI: object
