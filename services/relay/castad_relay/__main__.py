from castad_relay import service

service.app()
