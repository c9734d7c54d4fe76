app_name = "planner"
urlpatterns: list = []
