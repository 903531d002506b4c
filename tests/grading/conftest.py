"""The grading tests' markers, registered also when plain pytest runs them without the grader's plugin."""


def pytest_configure(config):
    config.addinivalue_line("markers", "points(n): what a grading test is worth when it passes (default 1)")
