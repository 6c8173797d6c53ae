"""Code the tests run in child processes, kept in modules rather than in strings.

Not collected by pytest (no ``test_`` prefix).  Two kinds:

* scripts with a ``main(argv)``, each run in a fresh interpreter by a test,
  with an explicit environment (:func:`support.child_env`) and a timeout,
  through :func:`support.run_script` or :func:`support.child_process`, e.g.::

      python tests/children/workload.py crash-run PRODUCER CONSUMER
      python tests/children/batch_child.py advance-batch PRODUCER
      python tests/children/lease_child.py PRODUCER CONSUMER NOW
      python tests/children/worker_child.py signal DIR
      python tests/children/faulty_child.py OP MODE PRODUCER CONSUMER ARM

  Each script's docstring says what it does and how it is called.
  ``fault_shim.c`` is the C source of the LD_PRELOAD shim that
  ``test_storage_faults.py`` compiles and loads into ``faulty_child.py``.

* :mod:`children.racers`: targets of the ``spawn`` processes that
  :func:`support.start_on_barrier` releases together at a barrier.

Every child opens its own files; nothing is inherited.  The children import
only the standard library and ``reliable_flow`` (a test may import a child
module for the constants parent and child share).
"""
