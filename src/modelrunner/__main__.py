from modelrunner.cli import main

main()
