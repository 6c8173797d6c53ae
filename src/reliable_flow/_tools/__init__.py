"""Tools around the library: the command line, the demo, ``inspect``,
``snapshot`` and the experiment.  They use the public API and the stores'
read methods; none of them holds SQL of its own."""

__all__: list[str] = []
