from calc_tools.client import ask
from calc_tools.scoring import score

__all__ = ["ask", "score"]
