"""Running a test where its crash or hang cannot take the session with it.

The family, lowest first: :mod:`.settings` (options, markers, the limit of a
test) and :mod:`.record` (the last device op a process started, kept where its
parent can read it after a crash) import nothing else of pytest-mps;
:mod:`.child` runs one test in a child process and writes its reports;
:mod:`.outcome` turns a child that died or was killed into a failure report;
:mod:`.server` is the fork server that children start from before any device
is touched; :mod:`.watchdog` bounds a test that runs in the main process;
:mod:`.plugin` is the front door: it decides where each test runs.
"""
