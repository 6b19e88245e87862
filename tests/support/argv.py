"""A rendered command line read as the relations the tests assert: which entry point, and which
value each flag has. Order is not asserted here; the golden renders in tests/golden pin it."""


def flags(argv: list[str]) -> dict[str, str | None]:
    """`--flag value`, `--flag=value` or a bare `--flag` (None). A flag given twice fails: the
    runtime's parsers keep the last, which a test asserting the first would not see."""
    found: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        flag, equals, value = argv[i].partition("=")
        assert flag.startswith("--"), f"{argv[i]!r} in {argv} is not a flag"
        if not equals:
            takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            value = argv[i + 1] if takes_value else None
            i += takes_value
        assert flag not in found, f"{flag} given twice in {argv}"
        found[flag] = value
        i += 1
    return found


def entry_point(command: list[str]) -> tuple[str, dict[str, str | None]]:
    """(module, flags) of `python3 -m module --flag value ...`."""
    assert command[:2] == ["python3", "-m"], command
    return command[2], flags(command[3:])
