from castad_runtime import migrations

migrations.run_env()
