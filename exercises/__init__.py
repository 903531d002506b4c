"""Your answers to the course's exercises, one module per chapter. Grade them with
``minillm grade`` in a terminal or ``check("ch01")`` in a notebook."""
