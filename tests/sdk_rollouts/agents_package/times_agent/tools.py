from agents import function_tool


@function_tool
def multiply(a: int, b: int) -> str:
    """Multiply two integers and return the product."""
    return str(a * b)
