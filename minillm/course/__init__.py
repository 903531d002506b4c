"""The course tools: exercise generation, grading, and ``check`` for instant feedback in notebooks."""

from minillm.course.feedback import check
from minillm.course.grading import Report, Result, grade, load_impl

__all__ = ["check", "grade", "load_impl", "Report", "Result"]
