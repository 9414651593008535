from moejax.prune.cli import main

main()
