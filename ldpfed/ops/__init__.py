"""Operating a deployment rather than simulating one: fault drills (`drills`) that start clusters and servers and
signal the processes they started. The runtime (engine, algorithms, tracking) never imports this package; the
command line imports it only inside the command that runs a drill."""
