// placeholder translation unit; replaced as the folder grows
