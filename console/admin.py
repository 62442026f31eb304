from django.contrib import admin

# The admin index shows queue health above the apps (templates/console/index.html).
admin.site.index_template = "console/index.html"
admin.site.site_header = "Durable workers"
admin.site.site_title = "Durable workers console"
