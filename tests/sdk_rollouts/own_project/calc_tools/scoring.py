def score(answer: str, label: str | None) -> float:
    return 1.0 if label is not None and answer.strip() == label.strip() else 0.0
