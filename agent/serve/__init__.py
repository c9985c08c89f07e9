"""serve: one process per SSH connection (``python -m agent serve``) that speaks the
protocol with a console and answers its requests; dies with the connection.
"""
