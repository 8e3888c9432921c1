from castad_song import service

service.app()
