"""What several test files build the same way: sequences, attention batches, the tiny served engine.

Test files import from here (`from helpers.engine import run_engine`), never from one another;
pyproject's pytest settings put tests/ on the import path.
"""
