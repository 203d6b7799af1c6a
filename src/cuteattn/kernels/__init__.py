"""CuTe DSL kernels, one package per family (sm80: mma.sync + cp.async), each with a pure-Python
descriptor ``<family>/family.py`` (interface in ``family.py``); ``common`` holds what every
family uses."""
