from hooks.cli import main

main()
