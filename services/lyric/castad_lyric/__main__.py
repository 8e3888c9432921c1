from castad_lyric import service

service.app()
