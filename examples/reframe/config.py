"""A minimal ReFrame configuration: this machine, its local scheduler, one environment.

    reframe -C examples/reframe/config.py -c examples/reframe/pipeprof_check.py -r

The job inherits the environment reframe runs in (activate the one with pipeprof and your
framework first). ReFrame's perflogs (under ``--prefix``) get a line per run with every
performance variable and ``limiting_stage``. On a cluster, use your site's configuration
instead (a partition with a GPU, its scheduler and launcher): the check runs on any system.
"""

site_configuration = {
    "systems": [
        {
            "name": "local",
            "descr": "This machine, jobs run by the local scheduler",
            "hostnames": [".*"],
            "partitions": [
                {
                    "name": "default",
                    "scheduler": "local",
                    "launcher": "local",
                    "environs": ["python"],
                }
            ],
        }
    ],
    "environments": [{"name": "python"}],
}
