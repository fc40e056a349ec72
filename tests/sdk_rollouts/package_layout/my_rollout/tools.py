import json

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


def call(name: str, arguments: str) -> str:
    if name != "multiply":
        raise ValueError(f"unknown tool {name!r}")
    args = json.loads(arguments)
    product = args["a"] * args["b"]
    return str(int(product)) if float(product).is_integer() else str(product)
