"""Cross-device parity: the same computation on the test's device as on the CPU.

:mod:`.check` holds ``assert_device_parity`` and the ``device_parity`` helper
object; it runs the code on both devices with :mod:`.run` and compares every
leaf with :mod:`.compare`. Nothing here is imported until a test asks for it.
"""
