from django.urls import path

from . import views

app_name = "planner"
urlpatterns = [
    path("whatif", views.whatif_view, name="whatif"),
]
