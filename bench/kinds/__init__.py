"""One module per command, named as it runs: ``responses-ws bench <kind>`` is
``bench.kinds.<kind>`` and ``responses-ws demo`` is ``bench.kinds.demo`` (the shape of a
kind module: :mod:`bench`)."""
