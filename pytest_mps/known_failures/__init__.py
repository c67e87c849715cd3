"""Known failures pinned in a file (:mod:`.manifest`), checked by :mod:`.plugin`."""
