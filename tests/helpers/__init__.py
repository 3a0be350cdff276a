"""What the tests share: starting jobs in child processes (:mod:`helpers.launch`).

Imported as ``helpers`` (pytest puts ``tests/`` on ``sys.path``: ``tests/conftest.py`` lives there).
"""
