"""Reference answers to the exercises, marked with ``# BEGIN SOLUTION`` / ``# END SOLUTION``.
``minillm make-exercises`` strips the marked blocks to make ``exercises/``."""
