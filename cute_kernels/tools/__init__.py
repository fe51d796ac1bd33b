"""Tools around the kernels: the ``cute-kernels`` CLI (:mod:`.cli`), compiled-code inspection
(:mod:`.inspect`), the sm_90a resource report (:mod:`.report`) and the layouts CLI (:mod:`.layouts_cli`)."""
