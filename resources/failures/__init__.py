"""Known failure causes (full disk, read-only folder, lost executor, authorization, ...)
told in one line, and the log file an unforeseen failure's traceback is written to.
"""
