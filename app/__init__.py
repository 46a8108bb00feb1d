from .boolrefs import keep_bools_alive

keep_bools_alive()                # before any signal is emitted (see boolrefs.py)
