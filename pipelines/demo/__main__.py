"""`python -m quiver.pipelines.demo`: run the demo (`quiver.pipelines.demo.run`)."""

from quiver.pipelines.demo.run import main

main()
