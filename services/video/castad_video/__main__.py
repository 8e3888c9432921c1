from castad_video import service

service.app()
