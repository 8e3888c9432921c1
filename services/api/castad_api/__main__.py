from castad_api import service

service.app()
