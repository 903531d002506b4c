"""The course tools: exercise generation, grading, and ``check`` for instant feedback in notebooks."""

from minillm.course.answers import show_answer
from minillm.course.feedback import check
from minillm.course.grading import grade, load_impl
from minillm.course.results import ChapterRun, Report, Result

__all__ = ["check", "grade", "load_impl", "show_answer", "ChapterRun", "Report", "Result"]
