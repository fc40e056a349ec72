"""Running work items: the event loop, one row's workflow and grader, crash blame."""
