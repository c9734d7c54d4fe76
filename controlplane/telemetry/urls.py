app_name = "telemetry"
urlpatterns: list = []
