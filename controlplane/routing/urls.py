app_name = "routing"
urlpatterns: list = []
