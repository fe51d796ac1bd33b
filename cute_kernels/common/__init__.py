"""Blocks every kernel is built from, one place each: target facts (:mod:`.arch`), the compile cache
(:mod:`.jit`), TMA atoms and copies (:mod:`.tma`), the mbarrier ring (:mod:`.ring`), wgmma steps
(:mod:`.wgmma`), tile schedulers (:mod:`.scheduler`) and the last-CTA fixup protocol (:mod:`.fixup`)."""
